"""triton-serve analyze: sweep model configurations with perf_analyzer and pick the best one."""

"""triton-serve's ``python`` backend: runs Triton Python-backend models unchanged, one process per instance."""

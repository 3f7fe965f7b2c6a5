"""triton-serve's ``redis`` response cache: ``--cache-config redis,host=...,port=...`` as Triton's redis cache."""

"""triton-serve repository sources for cloud object stores: ``s3://``, ``gs://`` and ``as://`` locations."""

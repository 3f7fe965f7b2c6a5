"""The front-end side of the process boundary: the HTTP, gRPC and platform front-ends, and the process that
runs them apart from the model owner. Nothing here imports the owner's modules: a front-end reaches the
server only through the data-plane seam (``seam.py``), in-process or over the channel (``channel.py``,
``wire.py``); tests/test_frontend_imports.py keeps it so."""

"""triton-serve's engine: everything behind the public modules. Plugins import ``triton_serve.plugin``
(and their tests ``triton_serve.testing``); nothing here is a stable API."""

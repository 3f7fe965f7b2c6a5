"""Where PyTriton keeps its request type (``pytriton.proxy``)."""

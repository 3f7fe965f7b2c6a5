"""The SageMaker and Vertex AI listeners: front-end code (it runs in front-end processes too) that reaches the
models only through the data-plane seam."""

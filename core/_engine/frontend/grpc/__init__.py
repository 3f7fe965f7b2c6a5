"""The gRPC front-end: Triton's GRPCInferenceService and grpc.health.v1 over the shared data plane."""

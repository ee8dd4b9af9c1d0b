"""The only package that talks to Triton: tensor contract, config introspection, gRPC streams."""

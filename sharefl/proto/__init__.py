"""Wire formats: .proto files and generated gRPC modules (not yet implemented)."""

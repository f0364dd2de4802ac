//! gRPC health v1 (`grpc.health.v1.Health`: Check and Watch), fed by the health snapshot.

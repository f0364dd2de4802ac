//! HAProxy agent-check responder, fed by the health snapshot.

//! A target pool as the balancer sees it: who may get traffic, fail-open, slow start.

//! AWS Auto Scaling: the `aws-autoscaling` actuator ([`actuator`]) and discovery from
//! Auto Scaling groups ([`discovery`]), over a small client of AWS's Query APIs
//! ([`client`]) with credentials from the environment and the shared files
//! ([`credentials`]). `[aws]`, `[actuator.aws]` and `[discovery.aws]` are in
//! [`config`].
//!
//! ## Why not the AWS SDK
//!
//! The controller needs five calls of two Query APIs (`DescribeAutoScalingGroups`,
//! `DescribeAutoScalingInstances`, `SetInstanceHealth`,
//! `TerminateInstanceInAutoScalingGroup`, EC2 `DescribeInstances`). Measured once, a
//! release build from scratch of a scratch crate (tokio + reqwest, the controller's
//! HTTP client) and of the same crate with each option (docs/controller.md, "AWS:
//! SDK or signer", has the figures and the commands): the SDK (`aws-config`,
//! `aws-sdk-autoscaling`, `aws-sdk-ec2`) costs many times the build time and binary
//! size of `aws-sigv4` + reqwest's rustls + roxmltree, for a credential chain this
//! module does in one file. What the SDK would add that this does not (instance
//! roles, SSO, assumed roles) is listed in [`credentials`].

pub mod actuator;
pub mod client;
pub mod config;
pub mod credentials;
pub mod discovery;

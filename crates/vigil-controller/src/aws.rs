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
//! `TerminateInstanceInAutoScalingGroup`, EC2 `DescribeInstances`). Measured once
//! (docs/controller.md, "AWS: SDK or signer", has the table and the commands), a
//! release build from scratch over a tokio + reqwest + rustls baseline: the SDK
//! (`aws-config`, `aws-sdk-autoscaling`, `aws-sdk-ec2`) adds ~1,180 s of build CPU, 26
//! MB of binary and needs 8 GB to compile `aws-sdk-ec2`; `aws-sigv4` + `roxmltree` add
//! 42 s and 0.5 MB. What the SDK would add that this does not (instance roles, SSO,
//! assumed roles) is listed in [`credentials`].

pub mod actuator;
pub mod client;
pub mod config;
pub mod credentials;
pub mod discovery;

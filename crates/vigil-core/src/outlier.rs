//! Passive outlier detection: consecutive errors eject a target, with growing ejection times.

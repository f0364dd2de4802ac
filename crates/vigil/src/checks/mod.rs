//! Built-in checks: disk, file descriptors, memory, saturation, process, TCP, HTTP.

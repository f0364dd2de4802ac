//! The controller's safety guard: may it act on this target now, and why (not).

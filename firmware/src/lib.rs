//! The rig's portable firmware core. Empty until issue 3 ("Firmware: the rig's
//! microcontroller") lands: nothing here works yet.
#![no_std]

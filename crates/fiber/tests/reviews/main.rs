//! The reviewers' adversarial programs, one module per review round, in
//! one test binary (one link instead of one per round). Each module is a
//! self-contained review file; a test that needs a process of its own runs
//! in a child (`common::in_child`, which finds the module-qualified name).

#[path = "../common/mod.rs"]
mod common;

#[path = "../common/three_ways.rs"]
#[macro_use]
mod three_ways;

mod review10;
mod review12;
mod review15;
mod review16;
mod review18;
mod review19;
mod review20;
mod review21;
mod review22;
mod review23;
mod review24;
mod review25;
mod review26;
mod review27;
mod review28;
mod review29;
mod review30;
mod review31;
mod review32;
mod review33;
mod review34;
mod review35;
mod review36;
mod review37;
mod review38;
mod review39;
mod review4;
mod review40;
mod review42;
mod review43;
mod review44;
mod review45;
mod review47;
mod review48;
mod review49;
mod review5;
mod review50;
mod review51;
mod review52;
mod review53;
mod review54;
mod review55;
mod review56;
mod review57;
mod review58;
mod review59;
mod review60;
mod review61;
mod review62;
mod review63;
mod review64;
mod review65;
mod review66;
mod review67;
mod review68;
mod review69;
mod review7;
mod review70;
mod review71;
mod review72;
mod review73;
mod review8;

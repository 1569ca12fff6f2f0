//! The experiment lab, on top of the tracer: the bundled workloads that reproduce the
//! reference documents' experiments ([`workload`]), `verify` (each VMA step checked
//! against `/proc`), and `suite` with its report and charts. Behind the default-on `lab`
//! cargo feature, so a production build links neither plotters nor indicatif.

pub mod pressure;
pub mod report;
pub mod seeds;
pub mod suite;
pub mod verify;
pub mod workload;

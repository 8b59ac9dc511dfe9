//! `epx doctor`: prints the host library's doctor report ([`epx::doctor::report`]).

use std::process::ExitCode;
use std::sync::Arc;

use epx::Environment;

pub fn doctor(env: &Arc<Environment>) -> ExitCode {
    let (text, ok) = epx::doctor::report(env);
    print!("{}", epx::printable_lines(&text));
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

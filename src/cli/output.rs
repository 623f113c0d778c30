//! Standard output, for the command line's printers.

/// Writes to standard output. A reader that has gone (`| head`) ends the
/// command quietly, as other command-line tools end, where `print!` would
/// panic: nothing is left to say to anyone.
pub(crate) fn write_out(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        if error.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("delayline: cannot write to standard output: {error}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
}

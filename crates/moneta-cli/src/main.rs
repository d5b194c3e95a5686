mod plot;

fn main() {}

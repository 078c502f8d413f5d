"""What runs inside the traced process: activation, the import hook, native loads, the watchdog, the sink."""

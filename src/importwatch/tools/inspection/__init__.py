"""`importwatch inspect PID`: diagnose a process already hung, from outside, without restarting it."""

"""The watcher process: its main loop and its look at /proc (tracing/watcher_launch.py starts it)."""

"""The watcher process: its launch from the traced process, its main loop, and its look at /proc."""

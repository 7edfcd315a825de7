"""The engine step over the core: real time (threads, a clock) and simulated (an event heap)."""

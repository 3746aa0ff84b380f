"""What a cell measures and how: timing, warm-up, telemetry and conditions, the machine-speed
probe, the profiled steps and their breakdown, memory, and the numerics gate.
"""

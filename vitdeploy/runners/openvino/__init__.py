"""OpenVINO on a CPU: a loader that reads and compiles (loader.py) and a runner that executes (runner.py).

Neither module is imported until `--backend openvino` (or `auto` on a CPU where OpenVINO is installed) asks for it,
so `import openvino` stays out of every other path.
"""

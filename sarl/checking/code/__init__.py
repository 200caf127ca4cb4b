"""The code judge (docs/sandbox.md, decisions §8): `sandbox` (the API: `Sandbox`, `CodeProblem`, `problem_of`,
`last_code_block`), `process` (one program's run and the long-lived judge process), `cgroup` (memory and tasks of
all a program's processes together), `wire` (the framed plain-data messages between the two sides), and the two
scripts that run as `python -I -S -c <wire.py + script>`, never imported: `runner` (untrusted, inside bubblewrap) and
`judge` (trusted, runs the tests).
"""

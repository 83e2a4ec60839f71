"""Mutation pass over the pure policy packages (not run in CI; ``docs/mutation.md``).

``operators.py`` plants one bug per mutant with the standard library's ``ast``; ``runner.py``
copies the repository, runs the selected unit/reference tests against each mutant and writes the
report. ``scripts/mutation_pass.py`` is the command-line entry point.
"""

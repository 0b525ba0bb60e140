"""The tier of mistakes (issue 30): bad inputs and misuse over every command, each asserting the exit code, the one
error line (what was wrong and the fix), no traceback, an answer within seconds, and an untouched output directory.
Helpers: tests/support/mistakes.py. Files here run in the main CI tier (the signal cases are marked `dist`)."""

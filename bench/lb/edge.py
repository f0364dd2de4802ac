#!/usr/bin/env python3
"""Issue 38's edge inputs: what vigil lb, nginx and HAProxy do with each.

    python3 bench/lb/edge.py --vigil target/debug/vigil     # all three
    python3 bench/lb/edge.py --only nginx,haproxy           # the peers alone

The harness of bench/lb/smuggling.py (each proxy with its default configuration but
the listen address and one recording backend; a fresh connection per input), with
these inputs instead of its own. The rows of docs/lb.md's smuggling table for
userinfo, malformed Host values, a 2^64 - 1 chunk size and HTTP/1.2 were made from
this output; vigil's side is tested in crates/vigil-cli/tests/lb/edge.rs.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smuggling  # noqa: E402

smuggling.CASES = [
    ("absolute form with userinfo", "GET http://u:p@b:80/x HTTP/1.1\r\nHost: b\r\n\r\n"),
    ("Host with a space", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n"),
    ("Host with userinfo", "GET / HTTP/1.1\r\nHost: b:80@evil\r\n\r\n"),
    ("chunk size 2^64 - 1", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
     "ffffffffffffffff\r\nhi\r\n0\r\n\r\n"),
    ("chunk size 2^63 - 1", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
     "7fffffffffffffff\r\nhi\r\n0\r\n\r\n"),
    ("HTTP/1.2", "GET / HTTP/1.2\r\nHost: a\r\n\r\n"),
    ("HTTP/1.9", "GET / HTTP/1.9\r\nHost: a\r\n\r\n"),
    ("HTTP/2.1 request line", "GET / HTTP/2.1\r\nHost: a\r\n\r\n"),
]

if __name__ == "__main__":
    smuggling.main()

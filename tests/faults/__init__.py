"""Fault tests: real processes against damaged, held, full or foreign storage, crashes and
hostile input. Each test names the issue item it covers."""

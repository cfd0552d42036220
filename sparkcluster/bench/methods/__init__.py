"""Bench's methods: each is a request schedule (what it sends, and when) and an arithmetic (what it computes from
the timeline), over the one client (client.py), timeline (timeline.py) and rendering (render.py, plot.py)."""

"""Views of a run: viewer.py and viewer_draw.py (the pool step by step, a slider, an animated GIF), pool_page.py
(the same snapshots as a page in the browser), chrome_trace.py (a run as a Chrome/Perfetto trace).
"""

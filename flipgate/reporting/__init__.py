"""Human-readable reports of one old/new comparison: the rows and hints both share
(`rows`, `traffic` for a traffic set), rich terminal output (`terminal`) and an HTML page
(`html`, with its SVG charts and flip gallery); the experiment's pages (`experiment`).

Nothing is imported here: the server formats its gate's messages with `rows` and serves the
HTML page without loading rich, and a terminal-only caller loads neither the page's tables
nor its charts.
"""

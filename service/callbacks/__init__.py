"""Callbacks: a final decision's status POSTed to the URL its request gave, like a GitHub
commit status. `targets` says which URLs may be called (and keeps their credentials sealed),
`scheduling` when a callback is sent, sent again and given up, `delivery` what is POSTed and
how (worker.callbacks is its task; the worker's sweeper sends those due again)."""

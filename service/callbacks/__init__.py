"""Callbacks: a status POSTed to the URL a request gave, like a GitHub commit status.
`targets` says which URLs may be called (and keeps their credentials sealed), `scheduling` when a
callback is sent, sent again and given up, `delivery` how it is POSTed (worker.callbacks is
its task; the worker's sweeper sends those due again). What a final decision's status says
is the gate's (service.gate.statuses); this package imports no domain."""

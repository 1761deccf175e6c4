"""Frontends: what people see, built on the client library only.

One view model (:mod:`.view`) folds the stream for ``busd watch`` (the
terminal) and ``busd web`` (the browser); :mod:`.headless` is ``busd run``
for CI; :mod:`.demo` replays recordings. None imports the daemon: a private
daemon, where one is needed, is handed in (:mod:`.local`).
"""

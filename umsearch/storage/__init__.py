"""Files on disk without surprises: every file umsearch reads (``reading``: regular files only, bounded; ``jsonio``:
atomic, versioned JSON and TOML) and writes (``outputs``: atomic, never over what the user did not name;
``output_folder`` and ``manifest``: a folder shared with the user's files, all or nothing, under a lock),
the path checks both get (``paths``), and the signals held while files move into place (``signals``).
Below the contract: ``core`` reads and writes its profiles and plans through it."""

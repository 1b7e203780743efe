"""`localspec chat`: a Textual app to pick a backend and a target/draft pair, chat, and watch speculation.

Layout: `app.py` (the App: owns the loaded pipeline and the screens), `screens.py` (setup picker, chat,
settings), `widgets.py` (transcript messages, stats panel), `messages.py` (what workers post to the UI),
`session.py` (everything that does not need Textual: backend probing, stream merging, live stats,
transcript saving), `chat.tcss` (all styles).
"""

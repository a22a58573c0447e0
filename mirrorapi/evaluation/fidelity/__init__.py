"""Simulator fidelity: real held-out calls replayed through a virtual server (`replay`), compared (`metrics`),
reported (`report`), and episodes replayed with and without session history (`session_history`)."""

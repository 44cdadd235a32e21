"""``num_workers="auto"``: its bounds and layouts (``bounds``), the
model-based policy (``policy``) and its machine model (``model``), the
live tuner that measures the loader (``live``), and the climbing policy
kept for comparison (``climb``)."""

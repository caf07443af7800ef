"""Policy serving, rendering, trainers and the collect-then-train loop."""

-- The floor of bench/script-replay.sh: a script that does nothing.
return 1

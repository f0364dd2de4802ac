-- wrk script: one request every PACE_MS milliseconds per connection (default 10), so the
-- latency probe samples the endpoint instead of adding load of its own.
local pace = tonumber(os.getenv("PACE_MS") or "10")

function delay()
  return pace
end

-- bench/events.lua: wrk replays pre-signed deliveries, the same stream for every target.
--
--   wrk -t1 -c32 -d15s --latency -s bench/events.lua http://127.0.0.1:4000 -- FILE [PATH]
--
-- FILE holds one delivery a line: "<X-Service-Signature value>\t<JSON body>" (bench/run.py
-- writes it). PATH is where to POST, /v1/events unless given. Requests are formatted
-- once in init(); request() hands them out in order and starts over at the end of
-- the file (each wrk thread has its own copy and cursor, so use -t1 for a stream
-- without repeats). done() prints one line "BENCH {json}" for the orchestrator.

local requests = {}
local count = 0
local cursor = 0

function init(args)
  local file = args[1] or error("usage: -- FILE [PATH]")
  local path = args[2] or "/v1/events"
  for line in io.lines(file) do
    local sig, body = line:match("^([^\t]+)\t(.*)$")
    if sig then
      count = count + 1
      requests[count] = wrk.format("POST", path, {
        ["Content-Type"] = "application/json",
        ["X-Service-Signature"] = sig,
      }, body)
    end
  end
  if count == 0 then error("no deliveries in " .. file) end
end

function request()
  cursor = cursor % count + 1
  return requests[cursor]
end

function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, ' ..
    '"max_us": %d, "connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end

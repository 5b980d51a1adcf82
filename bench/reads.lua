-- bench/reads.lua: wrk sends GETs of the /v1 read API (bench/api.py), in turn from a file.
--
--   wrk -t1 -c32 -d15s --latency -s bench/reads.lua http://127.0.0.1:4000 -- FILE KEY [RATE]
--
-- FILE holds one path (with its query) a line; request() hands them out in order and starts
-- over at the end. KEY goes in "Authorization: Bearer KEY" ("-" for none). RATE, if given,
-- paces the requests to that many a second over all connections, as bench/events.lua does
-- (one schedule shared by the connections of the one thread). done() prints one line
-- "BENCH {json}" for the orchestrator; "status" counts answers that were not 2xx or 3xx.

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } reads_timespec;
int clock_gettime(int clk_id, reads_timespec *tp);
]]

local requests = {}
local count = 0
local cursor = 0
local interval = nil
local next_at = nil
local timespec = ffi.new("reads_timespec")

local function now()
  ffi.C.clock_gettime(1, timespec) -- CLOCK_MONOTONIC
  return tonumber(timespec.tv_sec) + tonumber(timespec.tv_nsec) / 1e9
end

local function paced_delay()
  local t = now()
  next_at = next_at or t
  local due = next_at
  next_at = next_at + interval
  if due <= t then return 0 end
  return math.floor((due - t) * 1000 + 0.5)
end

function init(args)
  local file = args[1] or error("usage: -- FILE KEY [RATE]")
  local key = args[2] or "-"
  local headers = {}
  if key ~= "-" then headers["Authorization"] = "Bearer " .. key end
  for path in io.lines(file) do
    if path ~= "" then
      count = count + 1
      requests[count] = wrk.format("GET", path, headers)
    end
  end
  if count == 0 then error("no paths in " .. file) end
  local rate = tonumber(args[3] or "")
  if rate and rate > 0 then
    interval = 1 / rate
    delay = paced_delay
  end
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

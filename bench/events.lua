-- bench/events.lua: wrk replays pre-signed deliveries, the same stream for every target.
--
--   wrk -t1 -c32 -d15s --latency -s bench/events.lua http://127.0.0.1:4000 -- FILE [PATH [RATE]]
--
-- FILE holds one delivery a line: "<X-Service-Signature value>\t<JSON body>" (bench/run.py
-- writes it). PATH is where to POST, /v1/events unless given. RATE, if given, paces the
-- requests to that many a second over all connections (wrk's delay() hook, one schedule
-- shared by the connections of the one thread; a connection still waits for its answer,
-- so a server slower than RATE sees the connections back to back). Requests are formatted
-- once in init(); request() hands them out in order and starts over at the end of
-- the file (each wrk thread has its own copy and cursor, so use -t1 for a stream
-- without repeats). done() prints one line "BENCH {json}" for the orchestrator.
--
-- Several servers (bench/pg.py, two replicas): BENCH_PORTS="PORT1,PORT2" in the environment
-- and -t2, one thread a port. setup() points thread i at the i-th port and init() keeps
-- every 2nd delivery of FILE from the i-th on, so the replicas never get the same event;
-- wrk still merges both threads' latencies into one histogram.

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]

local requests = {}
local count = 0
local cursor = 0
local interval = nil -- seconds between requests when paced
local next_at = nil  -- when the next paced request is due (CLOCK_MONOTONIC seconds)
local timespec = ffi.new("bench_timespec")

local function now()
  ffi.C.clock_gettime(1, timespec) -- CLOCK_MONOTONIC
  return tonumber(timespec.tv_sec) + tonumber(timespec.tv_nsec) / 1e9
end

local ports = {} -- BENCH_PORTS, in setup()'s state (wrk's main Lua state)
local threads = 0

function setup(thread)
  local spec = os.getenv("BENCH_PORTS")
  if not spec then return end
  if #ports == 0 then
    for port in spec:gmatch("%d+") do ports[#ports + 1] = port end
  end
  local slot = threads % #ports
  threads = threads + 1
  thread.addr = wrk.lookup(wrk.host, ports[slot + 1])[1]
  thread:set("bench_slot", slot)
  thread:set("bench_stride", #ports)
end

-- delay() is only defined when paced: wrk checks for it after init().
local function paced_delay()
  local t = now()
  next_at = next_at or t
  local due = next_at
  next_at = next_at + interval
  if due <= t then return 0 end
  return math.floor((due - t) * 1000 + 0.5)
end

function init(args)
  local file = args[1] or error("usage: -- FILE [PATH]")
  local path = args[2] or "/v1/events"
  local slot, stride = bench_slot or 0, bench_stride or 1 -- set by setup() with BENCH_PORTS
  local seen = 0
  for line in io.lines(file) do
    local sig, body = line:match("^([^\t]+)\t(.*)$")
    if sig then
      seen = seen + 1
      if (seen - 1) % stride == slot then
        count = count + 1
        requests[count] = wrk.format("POST", path, {
          ["Content-Type"] = "application/json",
          ["X-Service-Signature"] = sig,
        }, body)
      end
    end
  end
  if count == 0 then error("no deliveries in " .. file) end
  local rate = tonumber(args[3] or "")
  if rate and rate > 0 then
    interval = stride / rate -- each thread's share of the rate
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

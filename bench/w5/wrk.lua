-- W5's load: wrk drives one scenario against runq serve or the floor app.
--
--   W5_MODE=post|batch|get  W5_BODY_FILE=...  W5_IDS_FILE=...  W5_AUTH="Bearer ..."
--   wrk -t1 -c16 -d10s --timeout 10s -s bench/w5/wrk.lua http://127.0.0.1:PORT
--
-- post:  POST /runs with the body of W5_BODY_FILE (one run, background).
-- batch: POST /runs/batch with the body of W5_BODY_FILE (100 runs).
-- get:   GET /runs/{id}, cycling through the ids of W5_IDS_FILE (one a line) from a
--        random offset.
-- done() prints one line "W5JSON {...}": requests, seconds, errors by kind, latency
-- percentiles in microseconds (wrk's own histogram).

local mode = os.getenv("W5_MODE") or "post"
local auth = os.getenv("W5_AUTH") or ""
local ids = {}
local next_id = 1

local function read_file(path)
  local f = assert(io.open(path, "rb"), "cannot open " .. tostring(path))
  local text = f:read("*a")
  f:close()
  return text
end

local function set_headers()
  -- Added to wrk's own table, which holds the Host header HTTP/1.1 requires.
  wrk.headers["Content-Type"] = "application/json"
  if auth ~= "" then
    wrk.headers["Authorization"] = auth
  end
end

function setup(thread)
  thread:set("thread_offset", math.random(1, 1000000))
end

function init(args)
  if mode == "get" then
    for line in read_file(os.getenv("W5_IDS_FILE")):gmatch("[^\n]+") do
      ids[#ids + 1] = line
    end
    assert(#ids > 0, "W5_IDS_FILE holds no ids")
    next_id = (thread_offset or 1) % #ids + 1
    wrk.method = "GET"
    wrk.body = nil
  else
    wrk.method = "POST"
    wrk.path = (mode == "batch") and "/runs/batch" or "/runs"
    wrk.body = read_file(os.getenv("W5_BODY_FILE"))
  end
  set_headers()
end

if mode == "get" then
  -- A request function only for GET: POST keeps wrk's pre-built request (no Lua per call).
  request = function()
    local id = ids[next_id]
    next_id = next_id % #ids + 1
    return wrk.format("GET", "/runs/" .. id)
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local parts = {
    string.format('"requests":%d', summary.requests),
    string.format('"seconds":%.6f', summary.duration / 1e6),
    string.format('"bytes":%d', summary.bytes),
    string.format('"errors_connect":%d', e.connect),
    string.format('"errors_read":%d', e.read),
    string.format('"errors_write":%d', e.write),
    string.format('"errors_status":%d', e.status),
    string.format('"errors_timeout":%d', e.timeout),
    string.format('"lat_mean_us":%.1f', latency.mean),
    string.format('"lat_max_us":%d', latency.max),
  }
  for _, p in ipairs({ 50, 90, 99, 99.9 }) do
    local key = string.gsub(tostring(p), "%.", "_")
    parts[#parts + 1] = string.format('"lat_p%s_us":%d', key, latency:percentile(p))
  end
  io.write("W5JSON {" .. table.concat(parts, ",") .. "}\n")
end

-- bench/wire.py: POST /tasks tasks.create of 5-task trees (a root and 4 children of noop_executor), ids unique per
-- run (wrk ... -- <run prefix>) and thread; answers that are not a completed tree are counted.
local counter = 0
prefix = ""
failed = 0
local threads = {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function init(args)
  prefix = (args[1] or "run") .. "t" .. tostring(id)
end

function request()
  counter = counter + 1
  local p = prefix .. "-" .. counter .. "-"
  local tasks = string.format('{"id":"%sr","name":"r","schemas":{"method":"noop_executor"}}', p)
  for i = 1, 4 do
    tasks = tasks .. string.format(',{"id":"%s%d","name":"c","parent_id":"%sr","schemas":{"method":"noop_executor"}}', p, i, p)
  end
  local body = '{"jsonrpc":"2.0","id":1,"method":"tasks.create","params":[' .. tasks .. ']}'
  return wrk.format("POST", "/tasks", {["Content-Type"] = "application/json"}, body)
end

function response(status, headers, body)
  if status ~= 200 or not string.find(body, '"result":{', 1, true) or not string.find(body, '"status":"completed"', 1, true) then
    failed = failed + 1
  end
end

function done(summary, latency, requests)
  local bad = 0
  for _, thread in ipairs(threads) do bad = bad + thread:get("failed") end
  io.write(string.format("failed %d\n", bad))
  io.write(string.format("p50 %.2f ms p99 %.2f ms\n", latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end

import json, time
async def test_probe(client):
    t=time.time()
    r = await client.call("tasks.create", {"tasks": [{"id": "r", "name": "root"},{"id": "a", "name": "a", "parent_id": "r", "schemas": {"method": "noop_executor"}}]})
    print(time.time()-t, r["result"]["status"], r["result"]["children"][0]["status"])
    t=time.time()
    r = await client.call("tasks.create", {"tasks": [{"id": "r2", "name": "root"},{"id": "a2", "name": "a", "parent_id": "r2"}, {"id": "f2", "name": "f", "parent_id": "r2", "dependencies": ["a2"]}]})
    print(time.time()-t, r["result"]["status"], [c["status"] for c in r["result"]["children"]])
    t=time.time()
    r = await client.call("tasks.create", {"tasks": [{"id": "r3", "name": "root"},{"id": "a3", "name": "a", "parent_id": "r3", "schemas": {"method": "command_executor"}}, {"id": "f3", "name": "f", "parent_id": "r3", "dependencies": ["a3"]}]}, )
    print(time.time()-t, r["result"]["status"], [c["status"] for c in r["result"]["children"]])

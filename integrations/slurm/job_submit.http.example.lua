--[[
Example job_submit/lua script calling an HTTP API (NOT the Allmende plugin): POSTs the job as
JSON to ALLMENDE_ADMISSION_URL and rejects the job when the answer says {"decision":"reject"},
printing the answer's "message" to the user. Fails open (admits) when the API is unreachable.

Runs inside slurmctld: keep the timeout short, every submission waits for it. The URL comes
from slurmctld's environment (os.getenv works: slurmctld inherits start.sh's environment).
Modules: lua-socket and lua-cjson (Lua 5.1 builds; default package paths find them).
]]

local http = require("socket.http")
local ltn12 = require("ltn12")
local cjson = require("cjson")

local URL = os.getenv("ALLMENDE_ADMISSION_URL") or "http://127.0.0.1:8000/v1/admission"
http.TIMEOUT = 2 -- seconds, per socket operation

local function nz(v) -- cjson cannot encode nil inside tables; use cjson.null
  if v == nil then return cjson.null end
  return v
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local body = cjson.encode({
    user = nz(job_desc.user_name),
    uid = submit_uid,
    account = nz(job_desc.account or job_desc.default_account), -- nil unless -A given
    partition = nz(job_desc.partition),
    qos = nz(job_desc.qos or job_desc.default_qos),
    tres_per_node = nz(job_desc.tres_per_node),
    time_limit = nz(job_desc.time_limit),
    comment = nz(job_desc.comment),
  })
  local chunks = {}
  local ok, code = http.request({
    url = URL,
    method = "POST",
    headers = { ["content-type"] = "application/json", ["content-length"] = #body },
    source = ltn12.source.string(body),
    sink = ltn12.sink.table(chunks),
  })
  if not ok or code ~= 200 then
    slurm.log_error("job_submit.lua: %s unreachable or failed (%s); admitting", URL, tostring(code))
    return slurm.SUCCESS
  end
  local decoded, answer = pcall(cjson.decode, table.concat(chunks))
  if not decoded or type(answer) ~= "table" then
    slurm.log_error("job_submit.lua: unreadable answer from %s; admitting", URL)
    return slurm.SUCCESS
  end
  slurm.log_info("job_submit.lua: %s answered %s", URL, tostring(answer.decision))
  if answer.decision == "reject" then
    slurm.log_user("%s", tostring(answer.message or "rejected"))
    return slurm.ESLURM_ACCOUNTING_POLICY or slurm.ERROR
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

return slurm.SUCCESS

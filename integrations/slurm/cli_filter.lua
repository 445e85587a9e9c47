--[[
Allmende's cli_filter/lua plugin: runs in the user's own sbatch, salloc and srun, before slurmctld
is contacted, so the admission API's round trip costs nothing under slurmctld's lock. For a GPU job
it asks `POST /v1/admission` (with the submit token: it may only ask) and acts on the verdict:

  reject -> the command fails before anything is submitted; the user reads the API's sentence
  admit  -> the signed answer (the ticket) goes into the job's comment as `allmende-ticket:...`;
            job_submit.lua checks it inside slurmctld without asking anyone, and takes it out
  queue  -> the same, and the user reads why: job_submit.lua submits the job held for the agent

The job's account, partition and QOS, where the user gave none, are set to what was asked about
(the association's default account from sacctmgr, `default_partition` or Slurm's default
partition, `default_qos`), so that the job is exactly what its ticket is for.

When the API cannot be asked (down, slower than `timeout_s`, 5xx, a bad token; every `api_urls`
entry tried in turn): `fail_open` false (default) refuses the command with a sentence; true
submits the job without a ticket, and job_submit.lua holds it until the agent has an admission.
`dry_run`: asks with ?dry_run=true (nothing recorded) and passes the dry-run ticket along, for
job_submit.lua to log what it would do; nothing is refused and nothing is shown to the user.

This plugin runs on the user's side and can be bypassed (another SLURM_CONF, a rebuilt sbatch):
it is a convenience, never the check. Job steps (srun inside an allocation) are not asked about.
Needs lua-socket and lua-cjson (Lua 5.1 builds) and allmende_slurm.lua next to this file; reads
the same allmende.json as job_submit.lua, so that file must be readable by every user (keep the
secrets in `token_file` and `ticket_key_file`).
]]

local PREFIX = "allmende: "

-- This file's directory (slurm.conf's), where allmende_slurm.lua is: "@/etc/slurm/x.lua" -> "/etc/slurm".
local SCRIPT_DIR = (debug.getinfo(1, "S").source or ""):match("^@(/.*)/[^/]*$")
local ok_a, A = pcall(dofile, (SCRIPT_DIR or ".") .. "/allmende_slurm.lua")
if not ok_a then A = nil end
local ok_http, http = pcall(require, "socket.http")
local ok_ltn, ltn12 = pcall(require, "ltn12")
if not ok_http or not ok_ltn then http, ltn12 = nil, nil end

local function say(fmt, ...) slurm.log_info(PREFIX .. fmt, ...) end
local function shout(fmt, ...) slurm.log_error(PREFIX .. fmt, ...) end

local function command_line(cmd)
  local p = io.popen(cmd .. " 2>/dev/null")
  if p == nil then return nil end
  local out = p:read("*l")
  p:close()
  if out == nil or out == "" then return nil end
  return out
end

local function shell_word(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- "[D-]HH:MM:SS", "MM:SS", "MM" -> whole minutes (rounded up, as Slurm does); nil when unlimited.
local function minutes_of(text)
  if text == nil or text == "" or text:upper() == "UNLIMITED" or text:upper() == "INFINITE" then return nil end
  local days, rest = text:match("^(%d+)%-(.*)$")
  days = tonumber(days) or 0
  rest = rest or text
  local parts = {}
  for n in rest:gmatch("%d+") do parts[#parts + 1] = tonumber(n) end
  local h, m, s = 0, 0, 0
  if days > 0 or #parts == 3 then
    h, m, s = parts[1] or 0, parts[2] or 0, parts[3] or 0
  elseif #parts == 2 then
    m, s = parts[1], parts[2]
  elseif #parts == 1 then
    m = parts[1]
  end
  local total = ((days * 24 + h) * 60 + m) * 60 + s
  if total >= 2982616 * 1440 * 60 then return nil end -- Slurm's "unset" shows as a huge limit
  return math.ceil(total / 60)
end

local function count_of(text)
  if text == nil then return 1 end
  return tonumber(text:match("^(%d+)")) or 1
end

-- What the job asks for, from the command's options (only those the user set are in `set`).
local function facts_of(options, set, cfg, user)
  local gpus, slurm_type = 0, nil
  if set["gpus"] then
    gpus, slurm_type = A.gpus_in("gpu:" .. set["gpus"])
  end
  if gpus == 0 and set["gres"] then
    gpus, slurm_type = A.gpus_in(set["gres"])
    gpus = gpus * count_of(set["nodes"])
  end
  if gpus == 0 and set["gpus-per-node"] then
    gpus, slurm_type = A.gpus_in("gpu:" .. set["gpus-per-node"])
    gpus = gpus * count_of(set["nodes"])
  end
  if gpus == 0 and set["gpus-per-task"] then
    gpus, slurm_type = A.gpus_in("gpu:" .. set["gpus-per-task"])
    gpus = gpus * count_of(set["ntasks"])
  end
  return {
    account = set["account"], partition = A.first_of_list(set["partition"]), qos = set["qos"],
    gpus = gpus, slurm_type = slurm_type,
    interactive = options["type"] ~= "sbatch",
    time_minutes = minutes_of(set["time"]), user = user,
  }
end

-- The login name: $USER when set (a wrong one only costs the user their ticket: job_submit.lua
-- compares it with the name slurmctld authenticated), else `id -un` (a fork, a few ms).
local function user_name(options)
  local name = os.getenv("USER") or os.getenv("LOGNAME")
  if name and name ~= "" then return name end
  local uid = options["uid"]
  local own = command_line("id -un" .. (uid and (" " .. shell_word(uid)) or ""))
  return own or ("uid" .. tostring(uid))
end

local function default_partition(cfg)
  if cfg.default_partition then return cfg.default_partition end
  local p = io.popen("scontrol -o show partitions 2>/dev/null")
  if p == nil then return nil end
  local found = nil
  for line in p:lines() do
    if line:find("Default=YES", 1, true) then found = line:match("PartitionName=(%S+)") break end
  end
  p:close()
  return found
end

-- POST the request to each instance in turn; (status, answer, error text).
local function ask(cfg, body, dry_run)
  if http == nil or A.cjson == nil then return nil, nil, "lua-socket or lua-cjson is not installed" end
  local payload = A.cjson.encode(body)
  local last_err = "no api_url configured"
  for _, base in ipairs(cfg.api_urls) do
    local url = tostring(base):gsub("/+$", "") .. "/v1/admission" .. (dry_run and "?dry_run=true" or "")
    local chunks = {}
    http.TIMEOUT = tonumber(cfg.timeout_s) or 2
    local ok, code = http.request({
      url = url, method = "POST",
      headers = {
        ["content-type"] = "application/json",
        ["content-length"] = tostring(#payload),
        ["authorization"] = "Bearer " .. tostring(cfg.submit_token or ""),
      },
      source = ltn12.source.string(payload),
      sink = ltn12.sink.table(chunks),
    })
    if ok and code < 500 then
      local decoded, answer = pcall(A.cjson.decode, table.concat(chunks))
      if not decoded or type(answer) ~= "table" then answer = nil end
      return code, answer, nil
    end
    last_err = ok and ("HTTP " .. tostring(code) .. " from " .. tostring(base)) or (tostring(code) .. " at " .. tostring(base))
  end
  return nil, nil, last_err
end

local function detail_of(answer)
  if type(answer) ~= "table" then return nil end
  local d = answer.detail
  if type(d) == "string" then return d end
  if type(d) == "table" then
    if type(d.detail) == "string" then return d.detail end
    local first = d[1]
    if type(first) == "table" and first.msg then
      local loc = first.loc
      return string.format("%s: %s", type(loc) == "table" and tostring(loc[#loc]) or "?", tostring(first.msg))
    end
  end
  return nil
end

local function carry(options, ticket)
  local c = options["comment"]
  options["comment"] = A.TICKET_MARK .. ticket .. ((c and c ~= "") and (" " .. c) or "")
end

local function unavailable(cfg, what)
  if cfg.dry_run == true then return slurm.SUCCESS end
  if cfg.fail_open == true then
    say("the GPU budget service could not be asked (%s): the job is submitted and held until it admits it", what)
    return slurm.SUCCESS
  end
  shout("the GPU budget service could not be asked about this job (%s), so it is not submitted. " ..
    "Please try again in a minute; if this persists, contact your cluster admins.", what)
  return slurm.ERROR
end

function slurm_cli_pre_submit(options, offset)
  if A == nil then return slurm.SUCCESS end -- job_submit.lua holds the job; the agent decides
  if options["type"] == "srun" and (options["jobid"] or os.getenv("SLURM_JOB_ID")) then
    return slurm.SUCCESS -- a step inside an allocation: not a new job
  end
  local cfg, problem = A.load_config(SCRIPT_DIR)
  if problem and cfg._path == nil then return slurm.SUCCESS end -- not configured for users here
  local ok_set, set = pcall(A.cjson.decode, slurm.json_cli_options(options) or "{}")
  if not ok_set or type(set) ~= "table" then set = {} end
  local facts = facts_of(options, set, cfg, user_name(options))
  if facts.gpus < 1 then return slurm.SUCCESS end
  if facts.account == nil then
    facts.account = command_line("sacctmgr -nP show user " .. shell_word(facts.user) .. " format=DefaultAccount")
    if facts.account then options["account"] = facts.account end
  end
  if facts.partition == nil then
    facts.partition = default_partition(cfg)
    if facts.partition then options["partition"] = facts.partition end
  end
  if facts.account == nil or facts.partition == nil then
    return slurm.SUCCESS -- cannot tell what to ask: job_submit.lua holds it, the agent asks
  end
  if set["qos"] == nil and cfg.default_qos then options["qos"] = cfg.default_qos end
  local body = A.request(facts, cfg)

  local dry_run = cfg.dry_run == true
  local code, answer, err = ask(cfg, body, dry_run)
  if code == nil then return unavailable(cfg, err) end
  if code ~= 200 then
    local detail = detail_of(answer) or ("HTTP " .. tostring(code))
    if code == 401 or code == 403 then return unavailable(cfg, string.format("HTTP %d: %s", code, detail)) end
    if dry_run then return slurm.SUCCESS end
    shout("this job cannot be budgeted: %s", detail) -- 404 (unknown project or cluster), 409, 422
    return slurm.ERROR
  end
  if type(answer) ~= "table" or answer.verdict == nil then return unavailable(cfg, "its answer could not be read") end
  local verdict = tostring(answer.verdict)
  local sentence = A.is_null(answer.sentence) and "" or tostring(answer.sentence)
  local ticket = not A.is_null(answer.ticket) and tostring(answer.ticket) or nil
  if dry_run then
    if ticket then carry(options, ticket) end
    return slurm.SUCCESS
  end
  if verdict == "reject" then
    shout("%s", sentence ~= "" and sentence or "rejected by the GPU budget service")
    return slurm.ERROR
  end
  if ticket then carry(options, ticket) end
  if verdict == "queue" then
    say("the job is held for now: %s", sentence)
  end
  return slurm.SUCCESS
end

function slurm_cli_setup_defaults(options, early)
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, job_id, step_id)
  return slurm.SUCCESS
end

--[[
Allmende's job_submit/lua plugin: asks the platform's admission service about every GPU job at
submission (POST /v1/admission) and acts on the verdict.

  reject -> the submission fails; the user sees the API's sentence (slurm.log_user)
  admit  -> the job is submitted; in the opportunistic lane its QOS becomes `preemptible_qos`
  queue  -> the job is submitted held (priority 0), the reason in its comment and the request
            next to the admission id (`allmende-request:<JSON>`); the agent
            (integrations/slurm/agent.py) asks again and releases or cancels it

The admission job id ("slurm-<cluster>-<time>-<random>") is generated here, because Slurm assigns
its own job id only after job_submit, and stored in the job's admin_comment (or comment, see
`id_field`) as "allmende:<id>": the PrologSlurmctld/EpilogSlurmctld hooks
(integrations/slurm/lifecycle.py) publish the job's lifecycle under that id, which ties the
ledger's usage to the decision and its budget hold.

Jobs without GPUs are not asked about. When the API cannot be asked (unreachable, slow, a 5xx,
a bad token, no config), `fail_open` decides: true admits the job untouched, false refuses it
with a message saying why. `dry_run` asks the API with ?dry_run=true (nothing is recorded),
logs what it would do and always admits, changing nothing in the job.

The configuration is a JSON file (see integrations/slurm/README.md), read again at every
submission (so edits apply at once, no reload), found at the first of: $ALLMENDE_SLURM_CONFIG;
allmende.json next to this script (slurmctld loads job_submit.lua from the directory of
slurm.conf); allmende.json next to $SLURM_CONF; /etc/slurm/allmende.json. A config that was read
once stays in use while the file is unreadable.

Runs inside slurmctld, holding its job write lock: every submission waits for the API, so
`timeout_s` must stay short. Needs lua-socket and lua-cjson (Lua 5.1 builds).
]]

local NO_VAL = slurm.NO_VAL or 4294967294
local INFINITE = 4294967295
local NO_VAL16 = 65534

local DEFAULTS = {
  api_url = "http://127.0.0.1:8000",
  token = nil,
  token_file = nil,
  timeout_s = 2,
  fail_open = false,
  dry_run = false,
  id_field = "admin_comment", -- or "comment"
  clusters = {},              -- partition -> platform cluster (missing: the partition's name)
  default_partition = nil,    -- when the job names none and no partition is flagged Default
  projects = {},              -- account -> project (missing: the account's name)
  gpu_types = {},             -- Slurm GRES type -> platform GPU type (missing: the type as given)
  default_gpu_types = {},     -- platform cluster -> GPU type for an untyped --gres=gpu:N
  default_gpu_type = "H100",  -- ... when the cluster has none above
  priority_classes = { preemptible = "preemptible", normal = "standard", high = "non-preemptible" },
  default_priority_class = "standard",
  default_qos = "normal",     -- when neither the job nor the user's association names one
  preemptible_qos = "preemptible",
  interactive_qos = {},       -- QOS names whose jobs count as interactive (besides salloc/srun)
  default_hours = 1,          -- a job without a time limit (or an unlimited one) asks for this
}

local PREFIX = "allmende: "

local function log_info(fmt, ...) slurm.log_info(PREFIX .. fmt, ...) end
local function log_error(fmt, ...) slurm.log_error(PREFIX .. fmt, ...) end

local function try_require(name)
  local ok, mod = pcall(require, name)
  if not ok then
    log_error("require(%q) failed: %s", name, tostring(mod))
    return nil
  end
  return mod
end

local http = try_require("socket.http")
local ltn12 = try_require("ltn12")
local cjson = try_require("cjson")

-- -- configuration ---------------------------------------------------------------------------

local function dirname(path)
  if path == nil then return nil end
  return path:match("^(.*)/[^/]*$")
end

local function script_dir()
  local info = debug and debug.getinfo and debug.getinfo(1, "S")
  local source = info and info.source or ""
  if source:sub(1, 1) == "@" then source = source:sub(2) end
  if source:sub(1, 1) ~= "/" then return nil end
  return dirname(source)
end

local SCRIPT_DIR = script_dir()

local function config_candidates()
  local list = {}
  local env = os.getenv("ALLMENDE_SLURM_CONFIG")
  if env and env ~= "" then list[#list + 1] = env end
  if SCRIPT_DIR then list[#list + 1] = SCRIPT_DIR .. "/allmende.json" end
  local conf_dir = dirname(os.getenv("SLURM_CONF"))
  if conf_dir then list[#list + 1] = conf_dir .. "/allmende.json" end
  list[#list + 1] = "/etc/slurm/allmende.json"
  return list
end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  return text
end

local function is_null(v)
  return v == nil or (cjson ~= nil and v == cjson.null)
end

local last_good = nil -- the last configuration read successfully (used while the file is unreadable)

-- The configuration, and nil or a sentence saying why it could not be read.
local function load_config()
  if cjson == nil then
    return last_good, "lua-cjson is not installed"
  end
  local tried = {}
  for _, path in ipairs(config_candidates()) do
    local text = read_file(path)
    if text ~= nil then
      local ok, data = pcall(cjson.decode, text)
      if not ok or type(data) ~= "table" then
        return last_good, string.format("%s is not valid JSON (%s)", path, tostring(data))
      end
      local cfg = {}
      for k, v in pairs(DEFAULTS) do cfg[k] = v end
      for k, v in pairs(data) do
        if not is_null(v) then cfg[k] = v end
      end
      cfg._path = path
      if (cfg.token == nil or cfg.token == "") and cfg.token_file then
        local t = read_file(cfg.token_file)
        if t then cfg.token = t:gsub("%s+$", "") end
      end
      last_good = cfg
      return cfg, nil
    end
    tried[#tried + 1] = path
  end
  return last_good, "no configuration file (tried " .. table.concat(tried, ", ") .. ")"
end

-- -- the job ---------------------------------------------------------------------------------

local function unset(v)
  return v == nil or v == NO_VAL or v == INFINITE or v == NO_VAL16 or (type(v) == "number" and v < 0)
end

local function first_of_list(s)
  if s == nil or s == "" then return nil end
  return (s:match("^([^,]+)"))
end

-- GPUs and type in one TRES request string such as "gres:gpu:h100:2", "gres:gpu:3",
-- "gres/gpu:h100=2", "gres:gpu" (1), possibly among other comma-separated entries.
local function gpus_in(tres)
  if tres == nil or tres == "" then return 0, nil end
  local total, gpu_type = 0, nil
  for item in tres:gmatch("[^,]+") do
    local name = item:gsub("^gres[:/]", "")
    if name:match("^gpu") then
      local rest = name:sub(4)                 -- ":h100:2", ":2", ":h100=2", "=2", ""
      rest = rest:gsub("=", ":")
      local fields = {}
      for f in rest:gmatch("[^:]+") do fields[#fields + 1] = f end
      local count, kind = 1, nil
      if #fields >= 2 then
        kind, count = fields[1], tonumber(fields[#fields]) or 1
      elseif #fields == 1 then
        if tonumber(fields[1]) then count = tonumber(fields[1]) else kind = fields[1] end
      end
      total = total + count
      gpu_type = gpu_type or kind
    end
  end
  return total, gpu_type
end

-- Total GPUs and the Slurm GPU type (nil: untyped) the job asks for.
local function job_gpus(job_desc)
  local n, t = gpus_in(job_desc.tres_per_job)
  if n > 0 then return n, t end
  local nodes = job_desc.min_nodes
  if unset(nodes) or nodes < 1 then nodes = 1 end
  n, t = gpus_in(job_desc.tres_per_node)
  if n > 0 then return n * nodes, t end
  n, t = gpus_in(job_desc.tres_per_task)
  if n > 0 then
    local tasks = job_desc.num_tasks
    if unset(tasks) or tasks < 1 then tasks = 1 end
    return n * tasks, t
  end
  n, t = gpus_in(job_desc.tres_per_socket)
  if n > 0 then
    local sockets = job_desc.sockets_per_node
    if unset(sockets) or sockets < 1 then sockets = 1 end
    return n * sockets * nodes, t
  end
  return 0, nil
end

local function default_partition(part_list, cfg)
  if type(part_list) == "table" then
    for name, part in pairs(part_list) do
      local ok, flag = pcall(function() return part.flag_default end)
      if ok and (flag == 1 or flag == true) then
        local ok2, pname = pcall(function() return part.name end)
        return (ok2 and pname) or name
      end
    end
  end
  return cfg.default_partition
end

local function contains(list, value)
  if type(list) ~= "table" or value == nil then return false end
  for _, v in ipairs(list) do
    if v == value then return true end
  end
  return false
end

-- Minutes as hours, truncated to 9 decimals ("0.116666666"): the API rounds hours x 3600 up to
-- whole seconds, which gives exactly minutes x 60 again (a float could give one second more).
local function hours_of_minutes(minutes)
  local whole = math.floor(minutes / 60)
  local rest = minutes - whole * 60
  local frac = math.floor(rest * 1000000000 / 60)
  if frac == 0 then return string.format("%d", whole) end
  return string.format("%d.%09d", whole, frac)
end

local function requested_hours(job_desc, cfg)
  local limit = job_desc.time_limit
  if unset(limit) or limit == 0 then
    return tostring(cfg.default_hours), "default"
  end
  return hours_of_minutes(limit), nil
end

local function random_hex(bytes)
  local f = io.open("/dev/urandom", "rb")
  if f then
    local raw = f:read(bytes)
    f:close()
    if raw and #raw == bytes then
      return (raw:gsub(".", function(c) return string.format("%02x", c:byte()) end))
    end
  end
  local out = {}
  for i = 1, bytes do out[i] = string.format("%02x", math.random(0, 255)) end
  return table.concat(out)
end
math.randomseed(os.time() + math.floor((os.clock() * 1000000) % 1000000))

local function sanitize(s)
  return (tostring(s):gsub("[^A-Za-z0-9._:@/+-]", "_"))
end

-- What the admission API is asked, from the job description and the config.
local function request_of(job_desc, part_list, submit_uid, cfg)
  local gpus, slurm_type = job_gpus(job_desc)
  if gpus < 1 then return nil end
  local account = job_desc.account or job_desc.default_account
  local partition = first_of_list(job_desc.partition) or default_partition(part_list, cfg)
  local qos = job_desc.qos or job_desc.default_qos or cfg.default_qos
  local cluster = (partition and cfg.clusters[partition]) or partition or "unknown"
  local gpu_type
  if slurm_type then
    gpu_type = cfg.gpu_types[slurm_type] or slurm_type
  else
    gpu_type = cfg.default_gpu_types[cluster] or cfg.default_gpu_type
  end
  local interactive = (job_desc.script == nil) or contains(cfg.interactive_qos, qos)
  local hours, hours_note = requested_hours(job_desc, cfg)
  local user = job_desc.user_name
  if user == nil or user == "" then user = "uid" .. tostring(job_desc.user_id or submit_uid) end
  return {
    job_id = string.format("slurm-%s-%d-%s", sanitize(cluster), os.time(), random_hex(4)),
    project = (account and cfg.projects[account]) or account or "unknown",
    user = user,
    cluster = cluster,
    gpu_type = gpu_type,
    gpus = gpus,
    priority_class = cfg.priority_classes[qos] or cfg.default_priority_class,
    interactive = interactive,
    requested_hours = hours,
  }, { qos = qos, account = account, partition = partition, hours_note = hours_note }
end

-- -- the API ---------------------------------------------------------------------------------

-- POST the request; returns (status code or nil, decoded body or nil, error text or nil).
local function ask(cfg, body, dry_run)
  if http == nil or ltn12 == nil or cjson == nil then
    return nil, nil, "lua-socket or lua-cjson is not installed"
  end
  local url = cfg.api_url:gsub("/+$", "") .. "/v1/admission"
  if dry_run then url = url .. "?dry_run=true" end
  local payload = cjson.encode(body)
  local chunks = {}
  http.TIMEOUT = tonumber(cfg.timeout_s) or 2
  local ok, code = http.request({
    url = url,
    method = "POST",
    headers = {
      ["content-type"] = "application/json",
      ["content-length"] = tostring(#payload),
      ["authorization"] = "Bearer " .. tostring(cfg.token or ""),
    },
    source = ltn12.source.string(payload),
    sink = ltn12.sink.table(chunks),
  })
  if not ok then
    return nil, nil, tostring(code) -- "connection refused", "timeout", ...
  end
  local text = table.concat(chunks)
  local decoded, answer = pcall(cjson.decode, text)
  if not decoded or type(answer) ~= "table" then answer = nil end
  return code, answer, nil
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
      local where = type(loc) == "table" and tostring(loc[#loc]) or "?"
      return string.format("%s: %s", where, tostring(first.msg))
    end
  end
  return nil
end

-- -- acting on the answer ---------------------------------------------------------------------

-- `extra` (one word, no spaces) follows the tag: a queued job's request, for the agent
-- (integrations/slurm/agent.py) to ask again with.
local function tag_job(job_desc, cfg, admission_id, note, extra)
  local tag = "allmende:" .. admission_id
  if extra then tag = tag .. " " .. extra end
  if cfg.id_field == "comment" then
    local c = job_desc.comment
    local text = tag
    if note then text = text .. " " .. note end
    if c and c ~= "" then text = text .. " " .. c end
    job_desc.comment = text
  else
    local a = job_desc.admin_comment
    job_desc.admin_comment = (a and a ~= "") and (tag .. " " .. a) or tag
    if note then
      local c = job_desc.comment
      job_desc.comment = (c and c ~= "") and (note .. " " .. c) or note
    end
  end
end

-- The failure rule: the API could not be asked. fail_open admits untouched; otherwise refused.
local function unavailable(cfg, what, job_label)
  local fail_open = cfg and cfg.fail_open == true
  local dry_run = cfg and cfg.dry_run == true
  if fail_open or dry_run then
    log_error("%s: %s; admitting it untouched (%s)", job_label, what,
      dry_run and "dry_run" or "fail_open=true")
    return slurm.SUCCESS
  end
  log_error("%s: %s; refusing it (fail_open=false)", job_label, what)
  slurm.log_user("allmende: the GPU budget service could not be asked about this job (%s), " ..
    "so it is not submitted. Please try again in a minute; if this persists, contact your " ..
    "cluster admins.", what)
  return slurm.ERROR
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local cfg, problem = load_config()
  local label = string.format("job %s of %s", tostring(job_desc.name or "?"),
    tostring(job_desc.user_name or submit_uid))
  if cfg == nil then
    return unavailable(nil, "its configuration is missing: " .. tostring(problem), label)
  end
  if problem then
    log_error("%s; using the configuration read before from %s", problem, tostring(cfg._path))
  end

  local ok, body, facts = pcall(request_of, job_desc, part_list, submit_uid, cfg)
  if not ok then
    return unavailable(cfg, "the job could not be read: " .. tostring(body), label)
  end
  if body == nil then
    return slurm.SUCCESS -- no GPUs: nothing to budget
  end
  label = string.format("%s (%s: project %s, %s, %d %s GPUs, %s, %s%s h)", body.job_id, label,
    body.project, body.cluster, body.gpus, body.gpu_type, body.priority_class,
    body.interactive and "interactive, " or "", body.requested_hours)

  local dry_run = cfg.dry_run == true
  local code, answer, err = ask(cfg, body, dry_run)
  if code == nil then
    return unavailable(cfg, "the API at " .. tostring(cfg.api_url) .. " did not answer: " .. err, label)
  end
  if code ~= 200 then
    local detail = detail_of(answer) or ("HTTP " .. tostring(code))
    if code == 401 or code == 403 or code >= 500 then
      return unavailable(cfg, string.format("the API answered %d: %s", code, detail), label)
    end
    -- 404 (unknown project or cluster), 409, 422: the request itself cannot be admitted
    if dry_run then
      log_info("dry-run: %s: would reject: %s (HTTP %d)", label, detail, code)
      return slurm.SUCCESS
    end
    log_info("%s: refused by the API (HTTP %d): %s", label, code, detail)
    slurm.log_user("allmende: this job cannot be budgeted: %s", detail)
    return slurm.ERROR
  end
  if type(answer) ~= "table" or answer.verdict == nil then
    return unavailable(cfg, "the API's answer could not be read", label)
  end

  local verdict = tostring(answer.verdict)
  local lane = is_null(answer.lane) and "none" or tostring(answer.lane)
  local sentence = is_null(answer.sentence) and "" or tostring(answer.sentence)
  if dry_run then
    local action = ({
      reject = "reject the job",
      queue = "hold the job (priority 0)",
      admit = (lane == "opportunistic" and cfg.preemptible_qos)
        and ("admit it with QOS " .. tostring(cfg.preemptible_qos)) or "admit it",
    })[verdict] or verdict
    log_info("dry-run: %s: verdict %s, lane %s: would %s: %s", label, verdict, lane, action, sentence)
    return slurm.SUCCESS
  end

  if verdict == "reject" then
    log_info("%s: rejected: %s", label, sentence)
    slurm.log_user("%s", sentence ~= "" and sentence or "allmende: rejected by the GPU budget service")
    return slurm.ESLURM_ACCOUNTING_POLICY or slurm.ERROR
  elseif verdict == "queue" then
    -- The request itself (compact JSON: no spaces, no "=") goes next to the id, so that the
    -- agent asks again with exactly what was asked now.
    local stored = nil
    local enc_ok, encoded = pcall(cjson.encode, body)
    if enc_ok and type(encoded) == "string" and not encoded:find("[%s=]") then
      stored = "allmende-request:" .. encoded
    end
    tag_job(job_desc, cfg, body.job_id, "allmende: queued: " .. sentence, stored)
    job_desc.priority = 0
    log_info("%s: queued, submitted held (priority 0): %s", label, sentence)
    slurm.log_user("allmende: the job is held for now: %s", sentence)
    return slurm.SUCCESS
  elseif verdict == "admit" then
    tag_job(job_desc, cfg, body.job_id, nil)
    if lane == "opportunistic" and cfg.preemptible_qos and cfg.preemptible_qos ~= "" and
        facts.qos ~= cfg.preemptible_qos then
      job_desc.qos = cfg.preemptible_qos
      log_info("%s: admitted in the opportunistic lane; QOS %s -> %s", label, tostring(facts.qos),
        tostring(cfg.preemptible_qos))
    else
      log_info("%s: admitted (lane %s)", label, lane)
    end
    return slurm.SUCCESS
  end
  return unavailable(cfg, "the API answered an unknown verdict " .. verdict, label)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

log_info("job_submit.lua loaded (socket.http %s, cjson %s, config candidates: %s)",
  http and "ok" or "MISSING", cjson and "ok" or "MISSING", table.concat(config_candidates(), ", "))
return slurm.SUCCESS

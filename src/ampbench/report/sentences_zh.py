"""docs/FINDINGS.zh.md 的句子：与 sentences_en.py 同一组键，数字由代码格式化后填入，两版完全相同。

(The sentences of the Chinese edition; the same keys as sentences_en.py, every figure formatted by the
code before it arrives, so both editions show the same numbers.)
"""

ZH = {
    # ------------------------------------------------------------------ 报告框架
    "title": "# 结论：逐条检验教程的四个论断",
    "edition": "英文版（English）：[{name}]({name})。两版由同一命令从同一批结果生成，数字与运行 ID 完全相同。",
    "intro": "本文由 `ampbench findings` 根据实测运行自动生成，请勿手工编辑（需要更新时重新运行该命令）。"
    "输入：{inputs}。每个数字都注明其来源的 MLflow 运行（先是变体运行，再是各种子运行，均在该研究的跟踪库中）；"
    "数值为各种子的均值 ± 标准差；显著性检验为各种子间的 Welch 双样本 t 检验（与 `ampbench compare` 相同），"
    "p < 0.05。",
    "retold": "原教程在一块小显卡上为每种设置手工计时、各跑一次。我们把它的设置重跑了两遍：一遍在它的条件下"
    "（`tutorial/params.yaml`：torch DataLoader 加 PIL 变换、8 个 worker、eager 执行、batch 128、单卡），"
    "一遍在本项目的默认设置下（`params.yaml`：数据与数据增强放在 GPU 上、CUDA graph、batch 512）。"
    "我们没有教程的源代码：其 batch 大小和 worker 数是我们的推断。",
    "source.study": "本项目的研究",
    "source.tutorial": "教程的条件",
    "source.bench": "bench",
    "source.explain": "explain",
    "conditions.head": "| 研究 | 设置（single-fp32 的第一个种子） | single-fp32 的 MLflow 运行 |",
    "summary": "## 摘要",
    "claim.head": "## 论断 {n}：{claim}",
    "verdict": "**结论（论断 {n}）：{what}** — {reason}",
    "summary.line": "{n}. {claim} — **{what}**：{reason}",
    "na": "—",
    "p.na": "不适用（种子数 < 2）",
    # ------------------------------------------------------------------ 共用部分
    "cite": "变体运行 {variant}；种子运行 {seeds}",
    "setting": "{device}，batch {batch}，{loader}，{graph}，{dtype}，{seeds} 个种子，{epochs} 个 epoch",
    "loader.device": "数据在设备上",
    "loader.workers": "{loader}（{workers} 个 worker）",
    "graph.yes": "CUDA graph",
    "graph.no": "eager",
    # ------------------------------------------------------------------ 论断 1 和 2
    "speed.head": "| 研究 | 变体 | 图像/秒 | 训练秒数 | 毫秒/步 | 设置 | MLflow 运行 |",
    "speed.steady": "自检：上表各数字均稳定（每个种子第一个 epoch 之后的各 epoch 与其均值相差在 5% 以内（变异系数），"
    "各种子的图像/秒彼此相差在 5% 以内）。",
    "speed.noisy": "自检，有噪声：{which}。有噪声的数字是几种速度的平均：引用前请在空闲的机器上重新测量。",
    "bench.run": "bench 运行 `{run_id}`",
    "bench.untracked": "bench 文件，未跟踪：没有 MLflow 运行",
    "time.bench": "时间花在哪里（`ampbench bench`，{hardware}，batch {batch}；{source}）：教程的输入管线 "
    "{loader} 每秒供给 {loader_ips} 张图像；裸的 autocast 训练步（上限）每秒可跑 {ceiling_ips} 张，fp32 为 "
    "{fp32_ips} 张。由这个 DataLoader 供数时，无论精度如何，训练步都不可能快过它的供给速度："
    "教程条件下的 autocast 运行每秒训练 {run_ips} 张图像（{cite}）。",
    "time.nobench": "时间花在哪里（未提供 bench JSON）：同一个 autocast 训练步在教程的条件下每秒训练 {tut} 张图像，"
    "在本项目的条件下为 {proj} 张；差别来自输入管线、batch 大小和 eager 模式的逐个 kernel 启动。"
    "`ampbench bench --batch-size 128` 可以把它们分开测量。",
    "c1.tutorial": "原教程：20 个 epoch 在 fp32 下用了 22 分 22 秒，用 autocast 用了 21 分 21 秒（1.05x），"
    "各为一次手工计时。",
    "c1.bullet": "- {label}：autocast / fp32 = **{ratio}x**（按图像/秒计；图像/秒的 Welch p 为 {p}）",
    "c1.tf32": "- {label}：autocast / tf32 = **{ratio}x**（按图像/秒计；Welch p 为 {p}）：基准为启用 TF32 "
    "运算的 fp32，即 PyTorch 在 Ampere 及更新 GPU 上卷积的默认设置（上文的 fp32 为真正的 fp32）",
    "c1.rule": "加速比低于 {barely}x 视为“几乎没有”",
    "c1.both": "两种条件下分别为 {tut}x 和 {proj}x（{rule}）",
    "c1.tutorial_only": "教程条件下为 {tut}x，本项目默认设置下为 {proj}x（{rule}）",
    "c1.neither": "教程条件下为 {tut}x，本项目条件下为 {proj}x（{rule}）",
    "c1.unclear": "教程条件下为 {tut}x，本项目条件下为 {proj}x（{rule}），但落在该界线哪一侧仍在种子间的噪声之内：更多种子可定结论",
    "c2.tutorial": "原教程：使用 GradScaler 时 20 个 epoch 用了 27 分 27 秒，而 fp32 为 22 分 22 秒、仅用 autocast "
    "为 21 分 21 秒，各为一次手工计时。",
    "c2.bullet": "- {label}：GradScaler 的训练步耗时是 autocast 的 {cost}x（p {p_ac}）；"
    "其每秒训练图像数为 fp32 的 {ratio}x（p {p_fp}）",
    "c2.ceiling": "bench 上限（{source}）：使用 GradScaler 时每步 {gs} 毫秒，不使用时 {ac} 毫秒：相差 +{diff} 毫秒。",
    "c2.why": "它为什么有开销：scaler 先把损失乘以缩放因子，再对 fp32 梯度多做一遍处理（检查 inf/NaN 并反缩放；"
    "`_amp_foreach_non_finite_check_and_unscale_`），然后更新缩放因子：这是每步固定的开销，"
    "相对于计算密集的训练步很小。{profile}",
    "c2.noprofile": "未提供 kernel 性能剖析（`ampbench bench --profile 20`）。",
    "c2.profile": "autocast_gradscaler 训练步的性能剖析（{source}）：名为 `non_finite` 的 kernel"
    "（scaler 对 fp32 梯度的检查与反缩放）每步耗时 {us} 微秒{of}。",
    "c2.profile_of": "（每步共 {ms} 毫秒）",
    "c2.why_item": "{label}下为 fp32 的 {ratio}x",
    "c2.both": "两种条件下 GradScaler 都显著慢于 fp32：{why}",
    "c2.tutorial_only": "{why}",
    "c2.neither": "两种条件下都显著快于 fp32：{why}",
    "c2.unclear": "既无两种条件下的显著变慢，也无显著加速：{why}；更多种子可定结论",
    # ------------------------------------------------------------------ 论断 3 和 4
    "c3.tutorial": "原教程（各跑一次）：单卡从 0.8191 变为 autocast 的 0.8403，DP 从 0.8216 变为 0.8188，"
    "DDP 从 0.8224 变为 0.8162；加上 GradScaler 后“又升回”0.8409 / 0.8252。",
    "c3.head": "| 研究 | 变体 | 测试准确率 | 同模式的 fp32 | Δ | p（Welch） | Δ 的 90% 置信区间（百分点） "
    "| TOST p（±{margin} 个百分点） | 设置 | MLflow 运行 |",
    "c3.ci": "{low} 至 {high}",
    "c3.fp32_runs": "{cite}；fp32：{base}",
    "c3.note": "single-fp32 在不同种子间的标准差：{stds}（{studies}）；教程中的差异（+0.0212、-0.0028、-0.0062）"
    "都来自每种设置的单次运行。等价性检验：以 ±{margin} 个准确率百分点为界做两个单侧 Welch 检验（TOST，"
    "`report.equivalence_margin_pts`）；90% 置信区间完全落在界内时判为等价。",
    "c3.untested": "每个变体的种子少于 2 个：无法做显著性检验",
    "c3.tutorial_only": "显著：{names}",
    "c3.holds": "与 fp32 的显著差异：{names}",
    "c3.name": "{variant}（{label}，p {p}）",
    "c3.equivalent": "每个 AMP 变体的准确率都在 ±{margin} 个百分点内与 fp32 等价（{n} 个 TOST，全部 p < {alpha}）；"
    "没有任何差异超出种子间的随机波动",
    "c3.open": "与 fp32 的差异都没有超出种子间的随机波动（{n} 个 Welch 检验，全部 p >= {alpha}），"
    "但以下变体尚未证明在 ±{margin} 个百分点内等价：{which}；更多种子才能下结论",
    "c3.open_item": "{variant}（{label}{ci}）",
    "c3.open_ci": "，90% 置信区间 {low} 至 {high}",
    "c4.mechanism": "机制（torch 2.14，`torch/nn/parallel/parallel_apply.py`）：autocast 的状态是线程局部的，"
    "而 DataParallel 在各自的线程里运行每个副本，线程内以 "
    "`torch.amp.autocast(device_type, enabled=torch.is_autocast_enabled())` 重新进入 autocast："
    "外层 autocast 的 *enabled* 标志会传入副本，但它的 dtype 不会。新线程使用设备默认的 autocast dtype，"
    "在 CUDA 上是 float16。因此当 autocast 放在 `forward` 之外时，无论外层是 float16 autocast（教程的 dtype）"
    "还是 bfloat16 autocast，副本都以 float16 运行，而不是 fp32。本项目在 `forward` 内部进入 autocast"
    "（model.py），所以每个副本都运行所配置的 dtype；`replica_dtypes` 记录每个副本第一个卷积的输出类型。",
    "c4.bullet": "- {label}，{variant}：autocast 位置 {place}，副本运行 `{dtypes}`（{setting}；{cite}）",
    "c4.demo": "演示方法：`train.dp_autocast_outside_forward: true`（仅为本论断设置的参数）把 autocast 移到 "
    "`forward` 之外；`pytest -m gpu tests/training/test_autocast_placement.py` 在两块或更多 GPU 上断言每个"
    "副本实际运行的 dtype。单卡时 DataParallel 直接调用模块本身，因此无法在单卡上演示。",
    "c4.untested": "尚无在 2 块以上 GPU 上、autocast 位于 forward 之外的 dp 运行（多卡运行待做）；"
    "torch 2.14 的源码表明副本运行 float16，而非 fp32",
    "c4.holds": "副本运行 {dtypes}",
    "c4.not": "autocast 位于 forward 之外时，副本运行 {dtypes}，而非 float32",
    # ------------------------------------------------------------------ 原因：开销阶梯
    "why.head": "## AMP 为什么有时划算、有时不划算：开销阶梯（论断 1 和 2）",
    "why.none": "未提供阶梯数据：`make explain`（`ampbench explain`）可在几分钟内在这块 GPU 上测出，"
    "再用 `ampbench findings --explain reports/explain.json` 把它放到这里。",
    "why.intro": "`ampbench explain` 在 {hardware} 上测得（{source}；TF32 关闭；{windows} 个窗口、每窗口 {steps} 步的中位数）："
    "从教程的条件（R0）出发，每一级只改一处，直到本项目的默认设置{defaults}及更进一步。",
    "explain.run": "explain 运行 `{run_id}`",
    "explain.untracked": "explain 文件，未跟踪：没有 MLflow 运行",
    "why.defaults_id": "（{rung}）",
    "why.cpu": "**在 CPU 上测得：这些数字不能说明任何 GPU 的情况。**",
    "why.table": "| 级 | 改动 | batch | fp32 图像/秒 | autocast 图像/秒 | autocast / fp32 "
    "| GradScaler / fp32 | 设备繁忙占比，fp32 / autocast | 每步主机同步次数，autocast "
    "| 峰值 MB，fp32 / autocast |",
    "why.r0": "在教程的条件下（{rung}），设备在 fp32 时有 {busy32} 的时间在工作，autocast 时为 {busyac}；"
    "autocast 的训练速度是 fp32 的 {ratio}x。",
    "why.waits": "此时设备大部分时间都在等待主机，训练步再快也几乎体现不出来：这就是论断 1 所说的“几乎没有”。",
    "why.top": "autocast 加速比的最大一次提升出现在 {rung}，即{change}：从 {before}x 升到 {after}x。",
    "why.defaults": "在本项目的默认设置下（{rung}），autocast 的训练速度是 fp32 的 {ratio}x，设备有 {busy} 的时间在工作。",
    "why.tf32": "若以 TF32（启用 TF32 运算的 fp32，PyTorch 在 Ampere 及更新 GPU 上卷积的默认设置）而非真正的 fp32 "
    "为基准，autocast 在该处（{rung}）的训练速度是其 {ratio}x；TF32 本身是 fp32 的 {tf32}x。",
    "why.gs": "逐级比较 GradScaler 与 autocast 的每秒训练图像数（论断 2）：{items}。",
    "why.cross": "batch 交叉点（默认设置下的裸训练步）：autocast {at15}达到 fp32 的 1.5x，{at2}达到 2x。",
    "why.from_batch": "从 batch {batch} 起",
    "why.no_batch": "在所试的 batch（{low}–{high}）中都没有",
    # ------------------------------------------------------------------ AMP 省下了什么
    "mem.head": "## AMP 省下了什么：显存与能耗",
    "mem.intro": "教程给出的使用 AMP 的第一个理由是节省显存。峰值 MB：一个种子训练期间 torch 在 GPU（rank 0）上"
    "分配的峰值显存。能耗：仅指 GPU 的能耗，即一个种子训练期间 NVML 能耗计数器计得的能耗（全部 epoch、所用的全部 GPU，"
    "含空闲功耗；主机 CPU，包括 DataLoader 的 worker，不计在内），仅在 GPU 提供该计数器时才有。",
    "mem.table": "| 研究 | 变体 | 峰值 MB | 相对 fp32 | 能耗 kJ | 图像/焦耳 | 能耗相对 fp32 | MLflow 运行 |",
    "mem.bullet": "- {label}：autocast 的峰值显存是 fp32 的 {mem_ac}（{delta} MB），GradScaler 为 {mem_gs}；{energy}",
    "mem.no_memory": "- {label}：未记录峰值显存；{energy}",
    "mem.energy": "autocast 的训练能耗是 fp32 的 {e_ac}，GradScaler 为 {e_gs}",
    "mem.no_energy": "未记录能耗（没有 NVML 计数器，或运行早于 ampbench 开始记录能耗）",
}

# 代码中以英文比较或解析的词语（研究、结论、论断、开销阶梯各级的改动）在中文版中的说法。
ZH_NAMES = {
    # studies
    "tutorial's conditions": "教程的条件",
    "project's defaults": "本项目的默认设置",
    # verdicts
    "holds": "成立",
    "does not hold": "不成立",
    "holds only under the tutorial's conditions": "仅在教程的条件下成立",
    "not shown either way": "尚无定论",
    "not tested here": "本项目尚未检验",
    # claims
    "autocast barely speeds training up": "autocast 几乎不能加快训练",
    "GradScaler slows training down, below no AMP at all": "GradScaler 会拖慢训练，甚至慢于完全不用 AMP",
    "AMP changes accuracy": "AMP 会改变准确率",
    "DataParallel needs autocast inside forward, or the replicas run in fp32": (
        "DataParallel 必须在 forward 内部启用 autocast，否则各副本以 fp32 运行"
    ),
    # the overhead ladder's rungs (measuring/rungs.RUNGS), by their English
    "the tutorial's conditions: DataLoader with PIL transforms, 8 workers, batch 128, eager, "
    "cuDNN autotuning off": "教程的条件：DataLoader 加 PIL 变换、8 个 worker、batch 128、eager、关闭 cuDNN 自动调优",
    "data and augmentation on the GPU": "数据与数据增强放到 GPU 上",
    "batch 512": "batch 512",
    "cuDNN autotuning": "cuDNN 自动调优",
    "the whole step replayed from a CUDA graph (the defaults)": "整个训练步由 CUDA graph 重放（默认设置）",
    "torch.compile inside the graph": "在 graph 内使用 torch.compile",
}

"""What a model learned, shown: every validation image's outcome gathered from the workers and the figures drawn
from it (outcomes: per class, confusion, most confused, worst images, calibration), the pictures (pictures:
curves, confusion matrix, histograms, reliability diagram, image sheets; examples: the worst images' validation
crops and files, the first training batch), the one-page report.html (page), and the review put together
(compose).
"""
